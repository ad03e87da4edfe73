"""What runs on its own: the media pipeline, the unlock scheduler and the live events
that subscriptions stream."""
