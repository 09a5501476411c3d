"""The relay's configuration: frozen, validated models and their loading.
"""
