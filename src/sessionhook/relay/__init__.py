"""The relay daemon: poll -> archive in SQLite -> signed webhooks with durable retry."""
