"""The composition root: builds the relay's collaborators and runs them.
"""
