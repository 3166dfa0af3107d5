"""The chat door (chat.md 3-4): bots, conversations and the live stream now; turns to follow."""
