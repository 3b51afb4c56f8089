"""BSMA social-analytics benchmark and the paper's §7 experiments for idivm (see README.md)."""
