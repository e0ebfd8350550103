"""The `tuimon` commands, one module each (`tuimon relay`'s is tuimon.relay.command, `prom
--serve`'s tuimon.prom_judge_command): its options and how it runs. tuimon.cli parses
the line (tuimon.commands.parser) and hands it to the command's module."""
