"""Pure figure builders and attention views."""
