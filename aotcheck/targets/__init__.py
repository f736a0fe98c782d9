"""Where programs compile: the topology table, chip families, meshes and partition rules."""
