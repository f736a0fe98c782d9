"""pytest glue (see issue 3)."""
