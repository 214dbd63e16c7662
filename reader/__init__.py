"""The consumer library: read a topic in full or through its compacted view."""

from shale.reader.lookup import Lookup, lookup
from shale.reader.table import Listener, TableView
from shale.reader.topic_reader import EARLIEST, LATEST, Position, TopicReader, parse_position

__all__ = ["EARLIEST", "LATEST", "Listener", "Lookup", "Position", "TableView", "TopicReader", "lookup",
           "parse_position"]
