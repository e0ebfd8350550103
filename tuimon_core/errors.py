"""The one kind of error a command reports without a traceback.

A `UsageError` means what the user typed or configured is wrong (a bad host list, a
token file with the wrong mode, a config key out of range): the commands print its
message, which says where and what to type, and exit 2. Anything else is a bug and
keeps its traceback.
"""


class UsageError(Exception):
    """Wrong input from the user: the message names the option or file and the fix."""
