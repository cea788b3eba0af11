"""Support code for the tests (importable as ``support`` because pytest puts ``tests/`` on
``sys.path``): filesystem wrappers that inject faults or count calls (``fs_wrappers``), the
change listings the change-tracking tests compare against (``listed_changes``), the generators of
the test vectors in ``tests/data/`` (``spark_key_type_vectors``, ``JavaHashCodes.java``) and the
script of the Spark job run without Python worker reuse (``spark_no_reuse_job``), the Spark
Connect server on loopback (``spark_connect``), the Connect client script of the flights job
(``connect_job``) and the equality of DataFrames as multisets of rows (``frames``)."""
