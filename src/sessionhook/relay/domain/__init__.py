"""Pure rules of the relay: events, lifecycle, rendering, retry, signing, the webhook
contract, address rules. Imports nothing else of the relay; no I/O.
"""
