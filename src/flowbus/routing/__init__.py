"""Content-based routing protocols over structured overlays (sans-IO cores)."""
