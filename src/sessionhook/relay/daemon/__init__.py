"""The composition root: builds the relay's collaborators and runs them.

:mod:`.daemon` (:class:`~.daemon.Daemon`) builds :mod:`.store_opening`, :mod:`.wiring`,
:mod:`.upstream`, :mod:`.readiness`, :mod:`.tasks` and :mod:`.reloader`; what they share is
:class:`~.state.DaemonState`.
"""
