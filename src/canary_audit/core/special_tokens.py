"""The special tokens' strings the audit writes into text, declared once
below every module that uses them (the chat format, the embedded models'
tokenizer, the vision-language path): the embedded chat markers and think
tags, and Qwen2.5-VL's image-block tokens."""

USER, ASSISTANT, END, PAD = "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
