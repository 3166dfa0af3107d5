"""Team tools' doors on the hub: the reconciler component, the JSON API and the pages (team-tools.md 4, 11, 12)."""
