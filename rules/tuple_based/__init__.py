"""Classical tuple-based diff propagation (t-diffs), the baseline the paper compares against
("idIVM with tuple-based diff propagation rules", §7): every diff is a full tuple, an update is
a Δ- of its pre-image and a Δ+ of its post-image, and a Δ- must be completed by joining the
other inputs' pre-state, where an i-diff would pass by its IDs. One module per operator whose
rules differ from the ID-based ones; the others are marked ``tuple_safe`` in ``rules/``."""
