"""The seal: a predictor's sealed child (namespaces, Landlock, the files it may read), the talk
with it, and the index of predictors it describes.
"""
