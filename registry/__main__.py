"""``python -m registry``: the ``jobreg`` CLI; also the file ``spark-submit`` runs to submit
the audit job to a cluster (README, "Running on a Spark cluster")::

    spark-submit --master spark://HOST:7077 --py-files jobreg.zip \\
        "$(python -c 'import registry, os; print(os.path.dirname(registry.__file__))')/__main__.py" \\
        --bootstrap kafka:9092 audit run --follow --db postgresql+psycopg://...
"""

from registry.cli import main

if __name__ == "__main__":
    main(prog_name="jobreg")
