"""Overlay protocol cores (sans-IO): what a node does on a message or a timer, as effects."""
