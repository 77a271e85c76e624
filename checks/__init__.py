"""Checks of the page that the page itself never runs, each run by hand (`python -m checks.NAME --help`):
`loadtest` (many visitors at once over the page's HTTP API), `pagecheck` (the speed the page reports against
the command line's) and `memcheck` (the page's memory over consecutive runs). They drive `app_parts`; the
load test serves the page from app.py's file rather than importing `app`."""
