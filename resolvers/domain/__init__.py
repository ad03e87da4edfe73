"""What people do: families, content, tags, capsules, notifications and profiles,
all under the one read rule (`access`)."""
