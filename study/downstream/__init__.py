"""downstream."""
