"""The demos (`tracecomp demo [cnn|gpt]`) and the pictures, plots and progress lines they draw."""
