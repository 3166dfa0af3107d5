"""The chat door (chat.md 3): bots now; conversations, turns and the live stream to follow."""
