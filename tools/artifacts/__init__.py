"""Stage 6, what the user takes away: configs, launch files, report, summaries.

DeepSpeed configs, launch files and guides, the report and its charts, the batch index, text.
"""
