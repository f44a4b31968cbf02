"""Document pieces every stage may share, so no stage imports another stage's package.

``config`` (where text is read from: ``TextSource``), ``sources`` (reading it), ``passthrough`` (an output
that is its input unchanged), ``shingles`` (words and shingle hashes), ``rules`` (a signal against a
threshold, in Python and as Spark SQL), ``plots`` (a classifier's score histogram), ``extract`` and
``normalize`` (a page's main text, normalised), ``content`` (binary bodies), ``urls``, and
``split`` (a decision written as ``documents/`` and ``excluded/``).
"""
