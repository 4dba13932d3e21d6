"""The --help format of every command of the kit (no MXNet import: runner uses it before choosing a Python)."""
import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """One default per flag: none added where the help already names it (or the recipes' values), where it is
    None, or for on/off switches; lists shown as typed (3,224,224)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, argparse.SUPPRESS, "") or action.nargs == 0 or "default" in text or \
                "recipe:" in text:
            return text
        value = action.default
        if isinstance(value, (list, tuple)):
            value = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
        elif isinstance(value, float):
            value = f"{value:g}"
        return f"{text} (default: {str(value).replace('%', '%%')})"
