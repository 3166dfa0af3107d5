"""Chat (chat.md): people talk to their Hermes bots; the domain of bots, conversations and turns, over the store."""
