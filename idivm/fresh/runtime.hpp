// idivm fresh-view runtime: maps, string interning, event files. C++17, standard library only.
//
// Map<K, NS>: a hash map from K 64-bit key words to a double, with NS secondary indexes over
// subsets of the key positions (the slices a trigger loops over). Why not std::unordered_map:
// node-based, one allocation per entry and a pointer chase per probe; a trigger does a few map
// operations per event, so those costs are the whole cost. Here entries live in one vector, the
// primary index is open addressing with linear probing (slot = entry id + 32 hash bits, so a
// miss never touches an entry), deletion is backward-shift (no tombstones: maps shrink and grow
// with every delete/insert), and each secondary index keeps an intrusive doubly linked list of
// the entries sharing a projected key, so removing an entry is O(1) in every index.
#pragma once
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace fv {

inline int64_t enc(double d) {
  if (d == 0.0) d = 0.0;  // one key for +0.0 and -0.0
  int64_t w;
  std::memcpy(&w, &d, 8);
  return w;
}
inline double dec(int64_t w) {
  double d;
  std::memcpy(&d, &w, 8);
  return d;
}

inline uint64_t fmix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

template <size_t K>
inline uint64_t hash_key(const std::array<int64_t, K>& k, uint32_t mask) {
  uint64_t h = 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i < K; ++i)
    if (mask >> i & 1u) h = (h ^ static_cast<uint64_t>(k[i])) * 0x100000001B3ULL + i;
  return fmix(h);
}

template <size_t K>
inline bool eq_masked(const std::array<int64_t, K>& a, const std::array<int64_t, K>& b,
                      uint32_t mask) {
  for (size_t i = 0; i < K; ++i)
    if ((mask >> i & 1u) && a[i] != b[i]) return false;
  return true;
}

struct Slot {
  uint32_t id;  // entry index + 1; 0 = empty
  uint32_t h;   // low hash bits: home slot and a cheap pre-compare
};

// Open addressing over entry ids; the caller supplies key equality for an id.
class Index {
 public:
  std::vector<Slot> slots;
  size_t used = 0;
  size_t mask = 0;

  Index() { reset(16); }
  void reset(size_t cap) {
    slots.assign(cap, Slot{0, 0});
    mask = cap - 1;
    used = 0;
  }
  template <class Eq>
  size_t find(uint32_t h, Eq&& eq) const {  // slot index of a match, or of the empty slot
    size_t i = h & mask;
    while (slots[i].id) {
      if (slots[i].h == h && eq(slots[i].id - 1)) return i;
      i = (i + 1) & mask;
    }
    return i;
  }
  void erase_at(size_t i) {  // backward-shift deletion
    size_t j = i;
    for (;;) {
      j = (j + 1) & mask;
      if (!slots[j].id) break;
      size_t k = slots[j].h & mask;
      bool move = (j > i) ? (k <= i || k > j) : (k <= i && k > j);
      if (move) {
        slots[i] = slots[j];
        i = j;
      }
    }
    slots[i] = Slot{0, 0};
    --used;
  }
  void rehash(size_t cap) {  // same entries, `cap` slots
    std::vector<Slot> old = std::move(slots);
    size_t n = used;
    reset(cap);
    for (const Slot& sl : old) {
      if (!sl.id) continue;
      size_t i = sl.h & mask;
      while (slots[i].id) i = (i + 1) & mask;
      slots[i] = sl;
    }
    used = n;
  }
  size_t bytes() const { return slots.capacity() * sizeof(Slot); }
};

template <size_t K, size_t NS, size_t V = 1>
class Map {
 public:
  using Key = std::array<int64_t, K>;
  struct Entry {
    Key key;
    std::array<double, V> val;  // V maps over the same keys and query, differing in values
    uint32_t live;
    std::array<uint32_t, NS> nxt, prv;  // per secondary index; entry id + 1, 0 = none
  };

  explicit Map(std::array<uint32_t, NS> masks = {}) : masks_(masks) {}

  const double* find(const Key& k) const {
    uint32_t h = static_cast<uint32_t>(hash_key<K>(k, full_));
    size_t i = prim_.find(h, [&](uint32_t id) { return entries_[id].key == k; });
    return prim_.slots[i].id ? entries_[prim_.slots[i].id - 1].val.data() : nullptr;
  }

  void add(const Key& k, size_t slot, double d) {
    if (d == 0.0) return;
    uint32_t h = static_cast<uint32_t>(hash_key<K>(k, full_));
    size_t i = prim_.find(h, [&](uint32_t id) { return entries_[id].key == k; });
    if (prim_.slots[i].id) {
      uint32_t id = prim_.slots[i].id - 1;
      Entry& e = entries_[id];
      e.val[slot] += d;
      if (e.val[slot] == 0.0) {
        for (size_t j = 0; j < V; ++j)
          if (e.val[j] != 0.0) return;
        unlink(id);
        prim_.erase_at(i);
        e.live = 0;
        free_.push_back(id);
      }
      return;
    }
    std::array<double, V> v{};
    v[slot] = d;
    insert_at(i, h, k, v);
  }

  // Several members' deltas for one key in one probe.
  void addv(const Key& k, const std::array<double, V>& d) {
    bool any = false;
    for (size_t j = 0; j < V; ++j) any |= d[j] != 0.0;
    if (!any) return;
    uint32_t h = static_cast<uint32_t>(hash_key<K>(k, full_));
    size_t i = prim_.find(h, [&](uint32_t id) { return entries_[id].key == k; });
    if (prim_.slots[i].id) {
      uint32_t id = prim_.slots[i].id - 1;
      Entry& e = entries_[id];
      bool live = false;
      for (size_t j = 0; j < V; ++j) live |= (e.val[j] += d[j]) != 0.0;
      if (!live) {
        unlink(id);
        prim_.erase_at(i);
        e.live = 0;
        free_.push_back(id);
      }
      return;
    }
    insert_at(i, h, k, d);
  }

  // f(key, values) for every entry whose key equals `probe` on the positions of index S.
  template <size_t S, class F>
  void slice(const Key& probe, F&& f) const {
    uint32_t h = static_cast<uint32_t>(hash_key<K>(probe, masks_[S]));
    const Index& ix = sec_[S];
    size_t i = ix.find(h, [&](uint32_t id) { return eq_masked<K>(entries_[id].key, probe,
                                                                  masks_[S]); });
    for (uint32_t id = ix.slots[i].id; id;) {
      const Entry& e = entries_[id - 1];
      uint32_t next = e.nxt[S];
      f(e.key, e.val.data());
      id = next;
    }
  }

  template <class F>
  void scan(F&& f) const {
    for (const Entry& e : entries_)
      if (e.live) f(e.key, e.val.data());
  }

  size_t size() const { return prim_.used; }
  void clear() {
    entries_.clear();
    free_.clear();
    prim_.reset(16);
    for (auto& s : sec_) s.reset(16);
  }
  size_t bytes() const {
    size_t b = entries_.capacity() * sizeof(Entry) + free_.capacity() * 4 + prim_.bytes();
    for (const auto& s : sec_) b += s.bytes();
    return b;
  }

 private:
  static constexpr uint32_t full_ = K >= 32 ? 0xffffffffu : ((1u << K) - 1u);
  std::array<uint32_t, NS> masks_;
  std::vector<Entry> entries_;
  std::vector<uint32_t> free_;
  Index prim_;
  std::array<Index, NS> sec_;

  void link(uint32_t id) {
    for (size_t s = 0; s < NS; ++s) {
      Entry& e = entries_[id];
      uint32_t h = static_cast<uint32_t>(hash_key<K>(e.key, masks_[s]));
      Index& ix = sec_[s];
      size_t i = ix.find(h, [&](uint32_t o) { return eq_masked<K>(entries_[o].key, e.key,
                                                                   masks_[s]); });
      e.prv[s] = 0;
      if (ix.slots[i].id) {
        uint32_t head = ix.slots[i].id;
        e.nxt[s] = head;
        entries_[head - 1].prv[s] = id + 1;
        ix.slots[i].id = id + 1;
      } else {
        e.nxt[s] = 0;
        ix.slots[i] = Slot{id + 1, h};
        ++ix.used;
        if (ix.used * 2 > ix.slots.size()) ix.rehash(ix.slots.size() * 2);
      }
    }
  }

  void unlink(uint32_t id) {
    for (size_t s = 0; s < NS; ++s) {
      Entry& e = entries_[id];
      if (e.prv[s]) {
        entries_[e.prv[s] - 1].nxt[s] = e.nxt[s];
        if (e.nxt[s]) entries_[e.nxt[s] - 1].prv[s] = e.prv[s];
        continue;
      }
      uint32_t h = static_cast<uint32_t>(hash_key<K>(e.key, masks_[s]));
      Index& ix = sec_[s];
      size_t i = ix.find(h, [&](uint32_t o) { return o == id; });
      if (e.nxt[s]) {
        ix.slots[i].id = e.nxt[s];
        entries_[e.nxt[s] - 1].prv[s] = 0;
      } else {
        ix.erase_at(i);
      }
    }
  }

  void insert_at(size_t i, uint32_t h, const Key& k, const std::array<double, V>& v) {
    uint32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = static_cast<uint32_t>(entries_.size());
      entries_.emplace_back();
    }
    Entry& e = entries_[id];
    e.key = k;
    e.val = v;
    e.live = 1;
    prim_.slots[i] = Slot{id + 1, h};
    ++prim_.used;
    link(id);
    if (prim_.used * 2 > prim_.slots.size()) prim_.rehash(prim_.slots.size() * 2);
  }
};

// Text values are interned: a map key or comparison sees a 64-bit id.
// LIKE patterns and SUBSTRING bounds are registered once by the generated code; their answers
// are memoized per string id (ids are dense), so a string seen before costs one array read.
struct Strings {
  std::unordered_map<std::string, int64_t> ids;
  std::vector<std::string> strs;
  struct LikeMemo {
    std::string pattern;
    std::vector<int8_t> memo;  // -1 unknown, 0, 1
  };
  struct SubstrMemo {
    int64_t start, length;
    std::vector<int64_t> memo;  // -1 unknown, else the id of the substring
  };
  std::vector<LikeMemo> likes;
  std::vector<SubstrMemo> substrs;

  int64_t intern(const std::string& s) {
    auto it = ids.find(s);
    if (it != ids.end()) return it->second;
    int64_t id = static_cast<int64_t>(strs.size());
    strs.push_back(s);
    ids.emplace(s, id);
    return id;
  }
  int pattern(const std::string& p) {
    for (size_t i = 0; i < likes.size(); ++i)
      if (likes[i].pattern == p) return static_cast<int>(i);
    likes.push_back(LikeMemo{p, {}});
    return static_cast<int>(likes.size() - 1);
  }
  int substring_of(int64_t start, int64_t length) {
    for (size_t i = 0; i < substrs.size(); ++i)
      if (substrs[i].start == start && substrs[i].length == length) return static_cast<int>(i);
    substrs.push_back(SubstrMemo{start, length, {}});
    return static_cast<int>(substrs.size() - 1);
  }
  bool like(int64_t id, int p) {
    std::vector<int8_t>& m = likes[p].memo;
    if (static_cast<size_t>(id) >= m.size()) m.resize(strs.size(), -1);
    if (m[id] < 0) m[id] = like_match(strs[id], likes[p].pattern) ? 1 : 0;
    return m[id] == 1;
  }
  int64_t substr(int64_t id, int q) {
    if (static_cast<size_t>(id) >= substrs[q].memo.size()) substrs[q].memo.resize(strs.size(), -1);
    if (substrs[q].memo[id] >= 0) return substrs[q].memo[id];
    const std::string& s = strs[id];
    const int64_t n = static_cast<int64_t>(s.size());
    // PostgreSQL: characters start … start+length-1, positions from 1
    int64_t b = std::max<int64_t>(substrs[q].start, 1) - 1;
    int64_t e = std::min<int64_t>(std::max<int64_t>(substrs[q].start + substrs[q].length - 1, 0), n);
    const int64_t r = intern(b < e ? s.substr(b, e - b) : std::string());
    substrs[q].memo[id] = r;
    return r;
  }
  // SQL LIKE: % any run, _ one character (greedy with backtracking to the last %)
  static bool like_match(const std::string& s, const std::string& p) {
    size_t i = 0, j = 0, star = std::string::npos, mark = 0;
    while (i < s.size()) {
      if (j < p.size() && p[j] == '%') {
        star = j++;
        mark = i;
      } else if (j < p.size() && (p[j] == '_' || p[j] == s[i])) {
        ++i;
        ++j;
      } else if (star != std::string::npos) {
        j = star + 1;
        i = ++mark;
      } else {
        return false;
      }
    }
    while (j < p.size() && p[j] == '%') ++j;
    return j == p.size();
  }
};

// Column types of the tables a view reads (matching idivm.fresh.expr).
enum Type : int { T_INT = 0, T_FLOAT = 1, T_STR = 2, T_DATE = 3, T_BOOL = 4 };

inline int64_t parse_value(const char* b, const char* e, int type, Strings& strs, bool used) {
  switch (type) {
    case T_INT:
      return std::strtoll(std::string(b, e).c_str(), nullptr, 10);
    case T_FLOAT:
      return enc(std::strtod(std::string(b, e).c_str(), nullptr));
    case T_DATE: {
      int y = 0, m = 0, d = 0;
      std::sscanf(std::string(b, e).c_str(), "%d-%d-%d", &y, &m, &d);
      return static_cast<int64_t>(y) * 10000 + m * 100 + d;
    }
    case T_BOOL:
      return (e > b && (*b == 't' || *b == 'T' || *b == '1')) ? 1 : 0;
    default:
      return used ? strs.intern(std::string(b, e)) : 0;
  }
}

// Split a line on `sep`, honouring double quotes ("a,b" and "" inside quotes).
inline void split(const std::string& line, char sep, std::vector<std::string>& out) {
  out.clear();
  std::string cur;
  bool q = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (q) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        q = false;
      } else {
        cur += c;
      }
    } else if (c == '"' && cur.empty()) {
      q = true;
    } else if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else if (c != '\r') {
      cur += c;
    }
  }
  out.push_back(cur);
}

// A parsed event stream: ops '+', '-', 'u' (update: new tuple, then old tuple when known).
struct Event {
  int32_t table;
  char op;
  uint32_t off;  // into Stream::words
};
struct Stream {
  std::vector<Event> events;
  std::vector<int64_t> words;
};

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

}  // namespace fv

namespace fv {

// Base rows by primary key, for events that name a row by its key (updates, order-book
// executions) and for refusing duplicate keys. Flat storage, one index on the key words.
class Rows {
 public:
  Rows(size_t arity, std::vector<int> pk) : n_(arity), pk_(std::move(pk)) {}

  const int64_t* find(const int64_t* row) const {
    uint32_t h = hash(row);
    size_t i = ix_.find(h, [&](uint32_t id) { return same_key(&data_[id * n_], row); });
    return ix_.slots[i].id ? &data_[(ix_.slots[i].id - 1) * n_] : nullptr;
  }
  bool insert(const int64_t* row) {
    uint32_t h = hash(row);
    size_t i = ix_.find(h, [&](uint32_t id) { return same_key(&data_[id * n_], row); });
    if (ix_.slots[i].id) return false;
    uint32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = static_cast<uint32_t>(data_.size() / n_);
      data_.resize(data_.size() + n_);
    }
    std::memcpy(&data_[id * n_], row, n_ * 8);
    ix_.slots[i] = Slot{id + 1, h};
    if (++ix_.used * 2 > ix_.slots.size()) ix_.rehash(ix_.slots.size() * 2);
    return true;
  }
  bool erase(const int64_t* row) {
    uint32_t h = hash(row);
    size_t i = ix_.find(h, [&](uint32_t id) { return same_key(&data_[id * n_], row); });
    if (!ix_.slots[i].id) return false;
    free_.push_back(ix_.slots[i].id - 1);
    ix_.erase_at(i);
    return true;
  }
  void overwrite(const int64_t* row) {  // same key, new values
    int64_t* p = const_cast<int64_t*>(find(row));
    if (p) std::memcpy(p, row, n_ * 8);
  }
  void clear() {
    data_.clear();
    free_.clear();
    ix_.reset(16);
  }
  size_t bytes() const { return data_.capacity() * 8 + ix_.bytes(); }

 private:
  size_t n_;
  std::vector<int> pk_;
  std::vector<int64_t> data_;
  std::vector<uint32_t> free_;
  Index ix_;

  uint32_t hash(const int64_t* row) const {
    uint64_t h = 0x9E3779B97F4A7C15ULL;
    for (int p : pk_) h = (h ^ static_cast<uint64_t>(row[p])) * 0x100000001B3ULL;
    return static_cast<uint32_t>(fmix(h));
  }
  bool same_key(const int64_t* a, const int64_t* b) const {
    for (int p : pk_)
      if (a[p] != b[p]) return false;
    return true;
  }
};

inline int64_t idiv(int64_t a, int64_t b) { return b == 0 ? 0 : a / b; }

}  // namespace fv
