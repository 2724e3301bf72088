"""A row cache written again from itself where its folder changed: grown by new files
(:mod:`.cache_growth`), the symbols of changed or removed files encoded again
(:mod:`.cache_reencode`), both written beside the cache and put in its place
(:mod:`.cache_rewrite`)."""
