"""Capture of what mmengine's current logger emits, shared by the
checkpoint-loading tests."""

import logging

from mmengine.logging import MMLogger


class MMLogs(logging.Handler):
    """The records mmengine's current logger emits inside the block.

    Example:
        >>> with MMLogs() as logs:
        ...     MMLogger.get_current_instance().warning('missing keys')
        >>> logs.messages
        ['missing keys']
    """

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    @property
    def messages(self):
        return [r.getMessage() for r in self.records]

    def __enter__(self):
        self.logger = MMLogger.get_current_instance()
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
