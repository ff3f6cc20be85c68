"""Built-in rules, one module per rule; each module's docstring gives the rule's formula."""
