"""Text data: CSV, TSV, JSON Lines, Parquet and `datasets` folders, tokenized by the model's own tokenizer
(rows: reading files; columns: roles; labels; tokenizer; dataset: the Dataset they make)."""
from optkit.measure.text.dataset import TextDataset, TextOptions, load_text, one_score_per_row, text_tokenizer
from optkit.measure.text.rows import MAX_ROW_BYTES, MAX_ROWS, is_text_data

__all__ = ["MAX_ROWS", "MAX_ROW_BYTES", "TextDataset", "TextOptions", "is_text_data", "load_text", "one_score_per_row",
           "text_tokenizer"]
