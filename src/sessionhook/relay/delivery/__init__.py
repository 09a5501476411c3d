"""Writing out: the dispatcher, the signed POST, the webhook sender, DNS pinning."""
