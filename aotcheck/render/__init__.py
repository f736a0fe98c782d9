"""How outcomes read: terminal text, the Markdown job summary, the HBM chart."""
