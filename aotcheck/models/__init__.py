"""Reference models aotcheck ships (and tests itself with)."""
