from boxqueue.compiled import pure_requested, use_pure_python

if pure_requested():
    use_pure_python()
