"""``python -m supervisord`` runs the ``jobsup`` command line."""

from supervisord.entry import main

main()
