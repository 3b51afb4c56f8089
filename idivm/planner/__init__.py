"""The four passes of the Δ-script generator (§4), a module each, plus the §5 schema generator."""
