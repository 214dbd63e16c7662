"""The consumer library: read a topic in full or through its compacted view."""

from shale.reader.table import TableView
from shale.reader.topic_reader import EARLIEST, LATEST, Position, TopicReader, parse_position

__all__ = ["EARLIEST", "LATEST", "Position", "TableView", "TopicReader", "parse_position"]
