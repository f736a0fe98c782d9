"""What compiles: configs and their registry, compiler options, lowering and the compile API."""
