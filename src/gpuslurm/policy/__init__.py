"""Pure decisions: facts and configuration in, verdicts out; nothing here touches the system."""
