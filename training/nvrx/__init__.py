"""NVIDIA Resiliency Extension, behind one adapter (`adapter`, also `python -m training.nvrx`): what a launch
verdict is, in-job restarts through ft_launcher (`restart`) and in-process restarts (`inprocess`)."""
