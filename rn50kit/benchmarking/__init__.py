"""benchmark.py's parts and what the benchmark tools share, MXNet-free: a configuration's runner command and its
run (runs), its report into figures (results), the Markdown tables (tables) and the chart (chart), the sweep of
every configuration (sweep), the machine the figures were measured on (machine); for the tools, the photo
RecordIO they time and check pipelines on (photos) and what a data pipeline's rates mean (pipeline_rates)."""
