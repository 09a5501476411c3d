"""Writing out: the dispatcher, the signed POST, the webhook sender, the address guard's
DNS half.
"""
