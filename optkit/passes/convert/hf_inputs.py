"""What convert.hf validates a Hugging Face model on: real English sentences (and sentence pairs, questions with
their context) tokenized by the model's own tokenizer and padded, in batches of several lengths, one of them
mostly padding; images through the model's own image processor. With --data, its rows come first."""
from __future__ import annotations

import numpy as np

# real sentences of varied length (4 to 60 words); the pairs and questions below are made of them
SENTENCES = (
    "The cat sat on the mat.",
    "Rain is expected tomorrow afternoon.",
    "A quantized model stores its weights as eight-bit integers instead of thirty-two-bit floats.",
    "She opened the window, and the smell of cut grass filled the small kitchen.",
    "Which train leaves for the coast before noon?",
    "The committee postponed its decision until the auditors had finished reviewing every contract signed since "
    "January.",
    "Dogs are loyal.",
    "In the nineteenth century, the river was the main road through the valley: barges carried grain, timber and "
    "coal downstream to the port, and returned with cloth, salt and news from the capital, so that every village "
    "along the banks grew up facing the water rather than the hills behind it.",
    "Please restart the server after the update has been installed.",
    "The recipe calls for two eggs, a cup of flour and a pinch of salt.",
    "Measurements taken on a busy machine carry more noise than those taken on an idle one.",
    "He missed the bus again.",
)
PAIRS = (
    ("The cat sat on the mat.", "A cat was sitting on a rug."),
    ("Rain is expected tomorrow afternoon.", "The forecast says it will be sunny all week."),
    ("Dogs are loyal.", "Dogs are faithful companions."),
    ("Please restart the server after the update has been installed.", "The update requires a restart."),
    ("He missed the bus again.", "The recipe calls for two eggs, a cup of flour and a pinch of salt."),
)
QUESTIONS = (
    ("What did the barges carry downstream?", SENTENCES[7]),
    ("When will the committee decide?", SENTENCES[5]),
    ("What does the recipe call for?", SENTENCES[9]),
    ("Where did the cat sit?", SENTENCES[0]),
)
LONG = 128          # the padded batch's length (at most the model's limit)
IMAGE_SIZES = ((200, 160), (320, 240), (96, 64))   # (width, height) of the validation images


def text_batches(tok, names: list[str], task: str, limit: int) -> tuple[list[dict[str, np.ndarray]], str]:
    """Batches of tokenized text for the task: (batches, what they are)."""
    if task == "question-answering":
        rows = [QUESTIONS, QUESTIONS[:2], QUESTIONS[3:]]
    elif task == "text-classification":
        rows = [SENTENCES, PAIRS, SENTENCES[:1]]
    else:
        rows = [SENTENCES, SENTENCES[6::5], SENTENCES[:1]]
    batches = [_encode(tok, names, list(r), None, limit) for r in rows]
    batches.append(_encode(tok, names, list(rows[0][:4]), min(LONG, limit), limit))  # mostly padding
    lengths = sorted({int(m.sum()) for b in batches for m in b["attention_mask"]})
    kind = {"question-answering": "questions with their context", "text-classification": "sentences and pairs"}.get(
        task, "sentences")
    return batches, (f"{sum(len(b['input_ids']) for b in batches)} rows of real {kind} in {len(batches)} padded "
                     f"batches, {lengths[0]} to {lengths[-1]} tokens")


def _encode(tok, names, rows, pad_to, limit) -> dict[str, np.ndarray]:
    pairs = isinstance(rows[0], tuple)
    first = [r[0] for r in rows] if pairs else rows
    second = [r[1] for r in rows] if pairs else None
    enc = tok(first, second, padding="max_length" if pad_to else "longest", max_length=pad_to or limit,
              truncation=True, return_tensors="np")
    out = {}
    for n in names:
        if n == "token_type_ids" and n not in enc:
            out[n] = np.zeros_like(enc["input_ids"], dtype=np.int64)
        else:
            out[n] = np.asarray(enc[n], dtype=np.int64)
    return out


def image_batches(processor, seed: int) -> tuple[list[dict[str, np.ndarray]], str]:
    """Images of several sizes (smooth gradients with seeded noise: natural images' statistics, roughly) through
    the model's image processor."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for w, h in IMAGE_SIZES:
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x / w * 255, y / h * 255, (x + y) / (w + h) * 255], axis=-1)
        pixels = np.clip(base + rng.normal(0, 20, base.shape), 0, 255).astype(np.uint8)
        images.append(Image.fromarray(pixels, "RGB"))
    whole = np.asarray(processor(images=images, return_tensors="np")["pixel_values"], dtype=np.float32)
    return [{"pixel_values": whole}, {"pixel_values": whole[:1]}], \
        f"{len(images)} images ({', '.join(f'{w}x{h}' for w, h in IMAGE_SIZES)}) through the model's image processor"


def data_batch(data, names: list[str], samples: int, seed: int) -> dict[str, np.ndarray] | None:
    """The user's data (--data) as one batch, where it holds the model's inputs by name."""
    if data is None or not all(n in data.arrays for n in names):
        return None
    ds = data.subset(samples, seed)
    return {n: np.asarray(ds.arrays[n][:]) for n in names}
