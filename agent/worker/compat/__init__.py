"""Stand-ins for third-party GPU libraries that task packages import (e.g. ``flash_attn``)."""
