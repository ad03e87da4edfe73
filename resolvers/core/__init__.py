"""Request plumbing: the per-request context and the services it carries, loaders,
pagination and cursors, errors, input rules, sign-in, configuration and rate limits."""
