"""The operator console: server-rendered pages under ``/console`` on the daemon's listener.

:mod:`.routes` lists the routes; :mod:`.pages`, :mod:`.lists`, :mod:`.actions`,
:mod:`.endpoint_forms` and :mod:`.live` never import each other; :mod:`.common`,
:mod:`.text` and :mod:`.chart` are what they share. Everything from upstream or a consumer
is hostile input: Jinja2 autoescapes, the script builds rows with ``textContent``, and
every page carries a strict Content-Security-Policy; nothing loads from another host.
"""
