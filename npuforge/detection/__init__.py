"""Object detection: COCO-format sets, a synthetic set for CPU training and tests, COCO mAP."""
