"""trioloop: a bounded, cancellable, reviewable AI tool loop for Trio."""
