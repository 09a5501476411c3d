"""A local emulator of the Sessions API: the whole ``/v1alpha`` surface and a scripted agent."""
