"""``python -m flowbus`` runs the command line."""

from flowbus.cli import main

main()
