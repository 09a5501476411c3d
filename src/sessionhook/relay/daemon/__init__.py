"""The composition root: builds the relay's collaborators and runs them.

:mod:`.daemon` (:class:`~.daemon.Daemon`: run, run_once, stop, reload; the loops) builds
:mod:`.store_opening` (the daemon lock, the store opened), :mod:`.wiring` (the HTTP clients,
pollers and dispatcher), :mod:`.upstream` (the budget windows in the store, the request
counts), :mod:`.readiness` (the web app it hands the web layer, /readyz, the full-disk
observer), :mod:`.tasks` (the side tasks) and :mod:`.reloader` (signals, SIGHUP); what they
share is :class:`~.state.DaemonState`. :mod:`.errors` and :mod:`.sdnotify` serve them all.
"""
