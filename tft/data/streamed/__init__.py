"""The path for a file whose rows need more host memory than the run may hold: three passes
over the file in chunks build a row cache on disk (NOTE [Row cache]), and the windows are
mapped from it."""
