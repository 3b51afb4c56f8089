// idivm fresh-view C ABI, included at the end of each generated program (which defines View,
// N_TABLES, TABLE_NAMES, TABLE_ARITY, TABLE_TYPES, DEPTH0). Loaded from Python with ctypes.
//
// Return codes of fv_apply: 0 done; -1 duplicate key (insert, or an update onto an existing
// key); -2 no row with that key (delete, update); -3 rows are not tracked (a key-only update
// after a tpch replay); -4 bad table or op. A refused event changes nothing.
#include <algorithm>
#include <tuple>
#include <unordered_map>

namespace {

enum Op { OP_INSERT = 0, OP_DELETE = 1, OP_UPDATE = 2, OP_UPSERT = 3 };

int apply(View& v, int table, int op, const int64_t* t, const int64_t* o) {
  if (table < 0 || table >= N_TABLES) return -4;
  const int n = TABLE_ARITY[table];
  fv::Rows& rs = v.rows[table];
  int64_t old[64];
  switch (op) {
    case OP_INSERT:
      if (v.track && !rs.insert(t)) return -1;
      v.on(table, 0, t, nullptr);
      return 0;
    case OP_DELETE: {
      if (!v.track) {
        v.on(table, 1, t, nullptr);
        return 0;
      }
      const int64_t* cur = rs.find(t);
      if (!cur) return -2;
      std::memcpy(old, cur, n * 8);  // the stored row: a delete names its row by key
      rs.erase(t);
      v.on(table, 1, old, nullptr);
      return 0;
    }
    case OP_UPDATE:
    case OP_UPSERT: {
      if (!v.track) {
        if (op == OP_UPSERT) return -3;
        v.on(table, 2, t, o);
        return 0;
      }
      const int64_t* cur = rs.find(op == OP_UPDATE ? o : t);
      if (!cur) {
        if (op == OP_UPDATE) return -2;
        rs.insert(t);
        v.on(table, 0, t, nullptr);
        return 0;
      }
      std::memcpy(old, cur, n * 8);
      if (rs.find(t) != cur) {  // the key changes
        if (rs.find(t)) return -1;
        rs.erase(old);
        rs.insert(t);
      } else {
        rs.overwrite(t);
      }
      v.on(table, 2, t, old);
      return 0;
    }
    default:
      return -4;
  }
}

int table_index(const std::string& name) {
  for (int i = 0; i < N_TABLES; ++i)
    if (name == TABLE_NAMES[i]) return i;
  return -1;
}

// Parse one row of `table` from fields[first…] into the stream's words.
bool push_row(View& v, fv::Stream& s, int table, const std::vector<std::string>& f,
              size_t first) {
  const int n = TABLE_ARITY[table];
  if (f.size() < first + n) return false;
  for (int i = 0; i < n; ++i) {
    const std::string& x = f[first + i];
    s.words.push_back(fv::parse_value(x.data(), x.data() + x.size(), TABLE_TYPES[table][i],
                                      v.strs, true));
  }
  return true;
}

struct Parsed {
  fv::Stream pre;   // static tables (nation, region): loaded before the clock starts
  fv::Stream main;  // the timed stream
  std::vector<uint32_t> old_off;  // per main event: offset of the old row (updates) or ~0u
  std::string error;
};

void add_event(fv::Stream& s, std::vector<uint32_t>* olds, int table, char op, uint32_t off,
               uint32_t old = ~0u) {
  s.events.push_back(fv::Event{table, op, off});
  if (olds) olds->push_back(old);
}

void parse_events(View& v, const char* path, Parsed& p) {
  std::ifstream in(path);
  if (!in) {
    p.error = std::string("cannot open ") + path;
    return;
  }
  std::string line;
  std::vector<std::string> f;
  size_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.empty()) continue;
    fv::split(line, ',', f);
    if (f.size() < 2 || f[0].size() != 1 || std::string("+-u").find(f[0][0]) == std::string::npos) {
      p.error = "line " + std::to_string(no) + ": expected op,table,values with op + - or u";
      return;
    }
    int t = table_index(f[1]);
    if (t < 0) continue;  // a table this view does not read
    if (f.size() != 2 + static_cast<size_t>(TABLE_ARITY[t])) {
      p.error = "line " + std::to_string(no) + ": table " + f[1] + " has " +
                std::to_string(TABLE_ARITY[t]) + " columns";
      return;
    }
    uint32_t off = static_cast<uint32_t>(p.main.words.size());
    push_row(v, p.main, t, f, 2);
    add_event(p.main, &p.old_off, t, f[0][0], off);
  }
}

// The order-book trace (t,id,action,volume,price) as events on bids/asks(T, ID, BROKER_ID,
// VOLUME, PRICE). Executions and cancellations name an order by id; the books are replayed
// here, while parsing, so the timed stream carries full rows (an execution is an update of
// VOLUME with its old row).
void parse_orderbook(View& v, const char* path, Parsed& p) {
  std::ifstream in(path);
  if (!in) {
    p.error = std::string("cannot open ") + path;
    return;
  }
  int book[2] = {table_index("bids"), table_index("asks")};
  if (book[0] < 0 && book[1] < 0) {
    p.error = "orderbook: the view reads neither bids nor asks";
    return;
  }
  for (int b = 0; b < 2; ++b)
    if (book[b] >= 0 && TABLE_ARITY[book[b]] != 5) {
      p.error = "orderbook: bids/asks need the columns (t, id, broker_id, volume, price)";
      return;
    }
  struct Order {
    int side;
    int64_t row[5];
  };
  std::unordered_map<int64_t, Order> live;
  std::string line;
  std::vector<std::string> f;
  const int vol_type = TABLE_TYPES[book[0] >= 0 ? book[0] : book[1]][3];
  auto num = [&](int64_t w, int type) { return type == fv::T_FLOAT ? fv::dec(w)
                                                                    : static_cast<double>(w); };
  auto word = [&](double x, int type) { return type == fv::T_FLOAT ? fv::enc(x)
                                                                    : static_cast<int64_t>(x); };
  auto push = [&](int side, const int64_t* row, char op, const int64_t* old) {
    int t = book[side];
    if (t < 0) return;
    uint32_t oo = ~0u;
    if (old) {
      oo = static_cast<uint32_t>(p.main.words.size());
      p.main.words.insert(p.main.words.end(), old, old + 5);
    }
    uint32_t off = static_cast<uint32_t>(p.main.words.size());
    p.main.words.insert(p.main.words.end(), row, row + 5);
    add_event(p.main, &p.old_off, t, op, off, oo);
  };
  while (std::getline(in, line)) {
    fv::split(line, ',', f);
    if (f.size() < 5 || f[2].empty()) continue;
    char a = f[2][0];
    int64_t id = std::strtoll(f[1].c_str(), nullptr, 10);
    if (a == 'B' || a == 'S') {
      int side = a == 'B' ? 0 : 1;
      int t = book[side] >= 0 ? book[side] : book[1 - side];
      Order o{side, {}};
      std::vector<std::string> r = {f[0], f[1], std::to_string(id % 10), f[3], f[4]};
      for (int i = 0; i < 5; ++i)
        o.row[i] = fv::parse_value(r[i].data(), r[i].data() + r[i].size(), TABLE_TYPES[t][i],
                                   v.strs, true);
      if (live.count(id)) continue;  // a repeated id: the book keeps the first
      live[id] = o;
      push(side, o.row, '+', nullptr);
    } else if (a == 'E' || a == 'D' || a == 'F') {
      auto it = live.find(id);
      if (it == live.end()) continue;
      Order& o = it->second;
      double left = 0;
      if (a == 'E') left = num(o.row[3], vol_type) - std::strtod(f[3].c_str(), nullptr);
      if (left > 0) {
        int64_t old[5];
        std::memcpy(old, o.row, 40);
        o.row[3] = word(left, vol_type);
        push(o.side, o.row, 'U', old);
      } else {
        push(o.side, o.row, '-', nullptr);
        live.erase(it);
      }
    }
  }
}

// TPC-H files of a directory (<table>.csv or .tbl, '|'-separated), the view's tables only:
// nation and region first and untimed (static tables, as DBToaster loads them), the others
// interleaved round-robin; files with an `order|op|` prefix (deletions) are merged by order.
void parse_tpch(View& v, const char* dir, Parsed& p) {
  struct Src {
    int table;
    std::vector<std::pair<int64_t, uint32_t>> rows;  // (order, offset) ; op in sign of order
    std::vector<char> ops;
  };
  std::vector<Src> srcs;
  fv::Stream tmp;
  bool with_order = false;
  std::vector<std::string> f;
  for (int t = 0; t < N_TABLES; ++t) {
    std::string base = std::string(dir) + "/" + TABLE_NAMES[t];
    std::ifstream in(base + ".csv");
    if (!in) in.open(base + ".tbl");
    if (!in) {
      p.error = "tpch: no " + base + ".csv or .tbl";
      return;
    }
    const bool is_static = !std::strcmp(TABLE_NAMES[t], "nation") ||
                           !std::strcmp(TABLE_NAMES[t], "region");
    Src src{t, {}, {}};
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      if (line.back() == '|') line.pop_back();
      fv::split(line, '|', f);
      const size_t n = TABLE_ARITY[t];
      size_t first = 0;
      int64_t order = static_cast<int64_t>(src.rows.size());
      char op = '+';
      if (f.size() == n + 2) {
        with_order = true;
        first = 2;
        order = std::strtoll(f[0].c_str(), nullptr, 10);
        op = f[1] == "0" ? '-' : '+';
      } else if (f.size() != n) {
        p.error = "tpch: " + base + ": expected " + std::to_string(n) + " fields";
        return;
      }
      fv::Stream& dst = is_static ? p.pre : tmp;
      uint32_t off = static_cast<uint32_t>(dst.words.size());
      push_row(v, dst, t, f, first);
      if (is_static) {
        add_event(p.pre, nullptr, t, op, off);
      } else {
        src.rows.emplace_back(order, off);
        src.ops.push_back(op);
      }
    }
    if (!is_static) srcs.push_back(std::move(src));
  }
  p.main.words = std::move(tmp.words);
  if (with_order) {
    std::vector<std::tuple<int64_t, int, size_t>> all;
    for (size_t s = 0; s < srcs.size(); ++s)
      for (size_t i = 0; i < srcs[s].rows.size(); ++i)
        all.emplace_back(srcs[s].rows[i].first, static_cast<int>(s), i);
    std::stable_sort(all.begin(), all.end(),
                     [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
    for (auto& [ord, s, i] : all)
      add_event(p.main, &p.old_off, srcs[s].table, srcs[s].ops[i], srcs[s].rows[i].second);
  } else {
    for (size_t i = 0;; ++i) {
      bool any = false;
      for (auto& s : srcs)
        if (i < s.rows.size()) {
          any = true;
          add_event(p.main, &p.old_off, s.table, s.ops[i], s.rows[i].second);
        }
      if (!any) break;
    }
  }
}

int run_event(View& v, const fv::Stream& s, const fv::Event& e, uint32_t old_off) {
  const int64_t* row = &s.words[e.off];
  switch (e.op) {
    case '+': return apply(v, e.table, OP_INSERT, row, nullptr);
    case '-': return apply(v, e.table, OP_DELETE, row, nullptr);
    case 'u': return apply(v, e.table, OP_UPSERT, row, nullptr);
    default: return apply(v, e.table, OP_UPDATE, row, &s.words[old_off]);
  }
}

}  // namespace

extern "C" {

void* fv_new() { return new View(); }
void fv_free(void* h) { delete static_cast<View*>(h); }
int64_t fv_intern(void* h, const char* s) { return static_cast<View*>(h)->strs.intern(s); }
const char* fv_string(void* h, int64_t id) {
  View* v = static_cast<View*>(h);
  return id >= 0 && id < static_cast<int64_t>(v->strs.strs.size()) ? v->strs.strs[id].c_str()
                                                                    : "";
}
int fv_apply(void* h, int table, int op, const int64_t* row, const int64_t* old) {
  return apply(*static_cast<View*>(h), table, op, row, old);
}
void fv_recompute(void* h) { static_cast<View*>(h)->recompute(); }
int64_t fv_map_size(void* h, int m) { return static_cast<View*>(h)->map_size(m); }
void fv_map_dump(void* h, int m, int64_t* keys, double* vals) {
  static_cast<View*>(h)->map_dump(m, keys, vals);
}
int64_t fv_bytes(void* h) { return static_cast<int64_t>(static_cast<View*>(h)->bytes()); }

// stats: [events processed (timed), seconds, map bytes at the end, parse seconds,
//         events in the stream, events refused]
int fv_replay(void* h, const char* path, int format, int track, double budget_s,
              int64_t max_events, double* stats, char* err, int errlen) {
  View& v = *static_cast<View*>(h);
  if (!track && v.track) {
    v.track = false;
    for (auto& r : v.rows) r.clear();
  }
  double t0 = fv::now_seconds();
  Parsed p;
  if (format == 0) parse_events(v, path, p);
  else if (format == 1) parse_orderbook(v, path, p);
  else parse_tpch(v, path, p);
  if (!p.error.empty()) {
    std::snprintf(err, errlen, "%s", p.error.c_str());
    return -1;
  }
  int64_t refused = 0;
  for (const auto& e : p.pre.events) refused += run_event(v, p.pre, e, 0) != 0;
  if (DEPTH0) v.recompute();
  double t1 = fv::now_seconds();
  const int64_t total = static_cast<int64_t>(p.main.events.size());
  const int64_t limit = max_events > 0 ? std::min(max_events, total) : total;
  int64_t i = 0;
  for (; i < limit; ++i) {
    refused += run_event(v, p.main, p.main.events[i], p.old_off[i]) != 0;
    if (DEPTH0) v.recompute();
    if (budget_s > 0 && (i & 63) == 63 && fv::now_seconds() - t1 > budget_s) {
      ++i;
      break;
    }
  }
  double t2 = fv::now_seconds();
  stats[0] = static_cast<double>(i);
  stats[1] = t2 - t1;
  stats[2] = static_cast<double>(v.bytes());
  stats[3] = t1 - t0;
  stats[4] = static_cast<double>(total);
  stats[5] = static_cast<double>(refused);
  return 0;
}

}  // extern "C"
