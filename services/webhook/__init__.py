"""The admission webhook: Tessera's scheduler name for pods that ask for a managed
device, and a refusal at creation for an invalid request or a hand-written grant."""
